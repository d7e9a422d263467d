"""Node maintenance from the shell, as an operator would with Slurm's sinfo/scontrol.

manage.py nodes                                    # every node not READY, or held, with its reason
manage.py nodes --all                              # every node
manage.py nodes drain h100-03 --reason "replace GPU 3"
manage.py nodes resume h100-03
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from scheduling.models import Node, NodeState
from scheduling.services import node_hold, node_resume

ACTOR = "manage.py nodes"


class Command(BaseCommand):
    help = "List nodes that are out of placement, or drain/resume one (audited as 'manage.py nodes')."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--all", action="store_true", help="list every node, not only those out of placement")
        actions = parser.add_subparsers(dest="action")
        drain = actions.add_parser("drain", help="no new work on the node until it is resumed; running work finishes")
        drain.add_argument("node", help="node name")
        drain.add_argument("--reason", required=True, help="why (shown on the cluster map)")
        resume = actions.add_parser("resume", help="return a drained node to placement")
        resume.add_argument("node", help="node name")

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts.get("action")
        if action is None:
            self._list(everything=opts["all"])
            return
        node = Node.objects.filter(name=opts["node"]).first()
        if node is None:
            raise CommandError(f"no node named {opts['node']!r}; `manage.py nodes --all` lists them")
        try:
            if action == "drain":
                node = node_hold(node=node, reason=opts["reason"], actor=None, actor_label=ACTOR)
            else:
                node = node_resume(node=node, actor=None, actor_label=ACTOR)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stdout.write(f"{node.name}: {node.state} {node.state_reason}".rstrip())

    def _list(self, *, everything: bool) -> None:
        nodes = Node.objects.select_related("leaf").order_by("name")
        if not everything:
            nodes = nodes.filter(~Q(state=NodeState.READY) | ~Q(hold_reason=""))
        rows = [(n.name, n.leaf.name, n.state, n.state_reason or "-", n.hold_reason or "-") for n in nodes]
        if not rows:
            self.stdout.write("every node is READY" if not everything else "no nodes have registered")
            return
        widths = [max(len(str(row[i])) for row in [("NODE", "LEAF", "STATE", "", ""), *rows]) for i in range(3)]
        self.stdout.write(f"{'NODE':<{widths[0]}}  {'LEAF':<{widths[1]}}  {'STATE':<{widths[2]}}  REASON  [HELD]")
        for name, leaf, state, reason, held in rows:
            tail = f"  [held: {held}]" if held != "-" and held not in reason else ""
            self.stdout.write(f"{name:<{widths[0]}}  {leaf:<{widths[1]}}  {state:<{widths[2]}}  {reason}{tail}")
