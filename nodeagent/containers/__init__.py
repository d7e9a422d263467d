"""Tasks in OCI containers (issue 26): the image cache (images.py), the runtime behind one small
interface (runtime.py; runc.py is the one there is), and what a launch asks of them (tasks.py).

A task whose spec names a `container` runs under the same wrapper as a host process
(nodeagent/launcher.py): its command is the runtime's foreground invocation, so exit status files,
logs, stops, time limits, the watchdog's fencing and adoption after a restart are the host path's.
See docs/containers.md and /work/brief/containers-contract.md for the spec and what runs inside.
"""
