"""Launching and supervising a job: torchrun under zeroscope (``launch``, ``torchrun_main``),
the job's output and errors (``job_relay``, ``job_errors``), how it ends (``job_end``), its
stop on Ctrl-C or a lost parent (``interrupts``, ``supervision``), the ``--as-deepspeed`` alias
and the advisor's trial runs (``advice_trial``). Nothing here draws a screen or computes a
figure: it starts processes and reports what they did."""
