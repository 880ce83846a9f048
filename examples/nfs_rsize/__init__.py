"""The KML NFS rsize worked example: an NFS client's read path over a
network on the readahead example's page cache (nfs), policies including the
compiled kmlc hook (experiment), training (train); run.py runs it all.
See README.md."""
