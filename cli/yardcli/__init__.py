"""yard: the Yardmaster command line, over the portal's REST API only (docs/job-files.md, README "Using it")."""

__version__ = "0.1.0"
