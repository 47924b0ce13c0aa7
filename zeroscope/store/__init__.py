"""The trace and where a viewer's messages come from: the SQLite trace (``trace``) and the
live-or-recorded sources behind one interface (``sources``)."""
