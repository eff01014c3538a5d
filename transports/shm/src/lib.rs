//! oxccl-transport-shm: placeholder (being written).
