"""The trace and where a viewer's messages come from: the SQLite trace (``trace``), the
live-or-recorded sources behind one interface (``sources``), and the one way a recorded trace
becomes a ClusterState (``feed``), used by every reader of a trace."""
