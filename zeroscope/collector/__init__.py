"""The collector: the ranks' door (``gate``: authentication, refusals), the receiving and
recording process (``server``) and its frames to viewers (``protocol``, the zguide "Clone"
pattern). Importing the package imports nothing heavy; ``server`` brings ZeroMQ."""
