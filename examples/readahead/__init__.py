"""The KML readahead worked example: a page-cache simulator with Linux 6.1's
readahead (sim), db_bench-like workloads (workloads), policies including
the compiled kmlc hook (experiment), training (train); run.py runs it all.
See README.md."""
