"""CLI subcommands, one module each: NAME, HELP, configure(parser), run(args) -> exit code."""
