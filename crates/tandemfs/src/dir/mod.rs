//! `dir`: GPU4FS H-tree directories (Kittner 2023) over a split-ordered list of entries.
