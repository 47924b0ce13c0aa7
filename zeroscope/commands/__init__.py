"""One module per ``zeroscope`` verb (see zeroscope/cli.py)."""
