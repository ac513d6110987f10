"""One training run: its settings and flags, its folder, identity and resumption, its
rounds, who runs them, what it spends, and the errors that stop it."""
