"""adloco inside the trainers people already use: each module is a callback that runs an algorithm's
hooked form (``with algo:``, :mod:`adloco.library.hooked`) for the length of training and saves and resumes the
algorithm's state with that trainer's own checkpoints.

    adloco.integrations.hf          transformers.Trainer (transformers is a dependency of adloco)
    adloco.integrations.lightning   PyTorch Lightning (pip install 'adloco[lightning]')

Nothing here is imported by ``import adloco``: a module imports its trainer only when you import it.
"""
