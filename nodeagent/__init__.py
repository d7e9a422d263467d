"""Yardmaster node agent: runs on every GPU node, never imports Django or the portal."""

__version__ = "0.1.0"
