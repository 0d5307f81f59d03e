"""``adloco train`` over torch.distributed: environment names and exit codes (:mod:`.env`), joining the
process group with liveness and start-up order (:mod:`.join`), and launching local processes, with or
without torch's elastic agent (:mod:`.launch`)."""
