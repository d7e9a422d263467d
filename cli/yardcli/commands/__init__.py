"""The `yard` commands, one module per group; yardcli.main registers them on the root group."""
