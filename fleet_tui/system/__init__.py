"""The operating system: processes (psutil or /proc) and the data and state folders."""
