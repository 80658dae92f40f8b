"""What a run leaves: its manifest, the run store, per-window scores and the gate over them."""
