"""A trial that crashes after printing a clue."""
import sys

print("loading data from /no/such/file")
raise SystemExit("trial crashed: data file missing")
