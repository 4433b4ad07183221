"""Each target family's CLI-layer code (readers, plan terms), one folder per family (the issue-24 layout)."""
