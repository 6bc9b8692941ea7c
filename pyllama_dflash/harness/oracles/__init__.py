"""What a run is judged against: the references a variant's drafts must equal (``references``), and the
comparison of a run's drafts with its reference's, with the proof that a difference is a tie (``drift``).

The references are runs of the slot loop (``pyllama_dflash.harness.slotloop``) in a mode of their own; the
engine runs them (``engine.matrix`` for the scenarios, ``engine.reference`` for the schedules), and
the oracles say what those runs mean for the run they judge.
"""
