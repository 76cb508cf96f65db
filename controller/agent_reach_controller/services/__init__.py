"""Use cases by job: intake, leasing, reporting, sweeps, admission, operator actions, queries."""
