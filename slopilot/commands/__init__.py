"""One module per `slopilot` subcommand: HELP, add_arguments(parser), run(args) -> int."""
