"""After a run, never inside it: run directories read back and priced (:mod:`.results`), plots
(:mod:`.plots`), the markdown report (:mod:`.markdown`), and ``adloco analyze-gradients``
(:mod:`.analysis`)."""
