"""The container runtime: the interface the worker drives (interface), the choice of one (choice), and its
implementations: plain processes (process) and runc containers (runc/). Nothing is imported here, so importing a
module of this package imports only what that module needs."""
