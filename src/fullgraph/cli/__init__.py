"""The `fullgraph` command. Each subcommand is a module here with `add_parser(subparsers)` and `run(args)`."""
