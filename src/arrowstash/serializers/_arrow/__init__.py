"""The Arrow serializer's parts: pandas conversion, batch grouping, packing and the IPC writer."""
