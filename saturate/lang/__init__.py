"""Rule language: grammar, parser, AST with file:line, load-time checks and builtins."""
