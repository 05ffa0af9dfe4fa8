"""One module per ``specsweep`` subcommand.

Each module defines ``COMMAND``: a :class:`harness.commands.base.Command` with its name, help, how to
add its arguments and how to run. ``harness.cli`` lists them; nothing else needs to change to add one.
"""
