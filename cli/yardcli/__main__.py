from yardcli.main import cli

cli()
