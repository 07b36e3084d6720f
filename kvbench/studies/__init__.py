"""Studies built on kvbench's public API (:mod:`kvbench.api`): they use kvbench as a user would."""
