"""Tests of packs, several devices in one task (fedqueue.fl.packs)."""
