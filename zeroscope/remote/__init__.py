"""Jobs on other machines and other nodes: discovery records (``zeroscope jobs``), the
system's OpenSSH and its tunnels (``ssh``, ``ssh_watch`` for ``zeroscope attach``), multi-node
launch (``multinode``) and when a job started elsewhere is over (``job_over``)."""
