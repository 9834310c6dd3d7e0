"""Goldens: the candidate's own outputs as files, and the judging of moved tokens."""
