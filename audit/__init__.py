"""The audit app: shortcut audits of CIR queries, their reports, protocol figures and leaderboards."""
