"""`python run.py [OVERRIDES...]`: compose an engine with Hydra, run a workload through it, write
its statistics — the same as `lab run` (lab/run.py, which an installed wheel has too)."""

from lab.run import main

if __name__ == "__main__":
    main()
