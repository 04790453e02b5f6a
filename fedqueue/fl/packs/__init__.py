"""Packs: several devices trained in one task. The run config's packing keys (section.py), the rules for
`auto`, the trial run at submit, its cache, and the tasks cut from a selection."""
