"""What the KML worked examples share: KML's model recipe and
cross-validation (training), and the plumbing of their one-command
pipelines (pipeline)."""
