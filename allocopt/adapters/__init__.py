"""Drop-in interfaces for other schedulers (``allocopt.adapters.gavel``)."""
