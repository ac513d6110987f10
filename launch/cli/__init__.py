"""How every program starts and ends: its flags read, libraries quieted, failures turned into one line and an exit status."""
