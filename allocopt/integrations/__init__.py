"""allocopt driving existing cluster managers through their own interfaces.

- :mod:`allocopt.integrations.slurm`: ``allocopt slurm``, a controller beside
  ``slurmctld`` that enacts the Engine's rounds with ``squeue``, ``sinfo`` and
  ``scontrol`` (hold, release on a GPU type, requeue-hold to preempt).
"""
