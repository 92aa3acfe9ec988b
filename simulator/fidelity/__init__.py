"""How close a simulation comes to live runs: a re-simulated run against its live log, what-ifs
against the live run of the changed config, tables over many runs, and the config differences."""
