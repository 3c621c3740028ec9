"""The CLI's commands, one module each; rlboost/cli/main.py registers them on the app.

A new command is a module here with its function (typer options in its signature, --help examples in
EXAMPLES) and one line in main.py; what several commands share lives in common.py.
"""
