//! The writer end to end on a temporary directory: files finished on
//! shutdown, rotation, drops under a full queue, recovery of a file cut short.
