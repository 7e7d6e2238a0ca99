//! FUSE adapter for tandemfs.
