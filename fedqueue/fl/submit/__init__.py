"""What a submit computes before anything of the run is stored (prepare.py: the torch work, here or apart)."""
