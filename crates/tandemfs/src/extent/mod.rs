//! `extent`: the FlexTree extent map of each file (FlexFile), with byte-granular insert and collapse.
