"""The `fedqueue` command line (commands.py): core commands, and each job kind's own from its JobKind."""
