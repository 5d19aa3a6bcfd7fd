"""The command line: ``tensorslim <subcommand>``; the entry point is :func:`tensorslim.cli.main.main`."""
