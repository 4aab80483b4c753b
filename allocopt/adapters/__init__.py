"""Drop-in interfaces for other schedulers: Gavel's policy objects (``allocopt.adapters.gavel``),
Sia's simulator policy (``allocopt.adapters.sia_simulator``), a Sia-style round policy
(``allocopt.adapters.sia``) and a Blox-style round hook (``allocopt.adapters.blox``)."""
