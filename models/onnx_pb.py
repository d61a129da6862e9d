# Minimal ONNX protobuf reading and writing for the model scripts in models/.
# The torch Python these scripts run under has no `onnx` package, so this speaks the
# protobuf wire format directly: it writes TensorProto (golden files) and reads just
# enough of a ModelProto for op histograms and initializer names.
# Field numbers follow onnx/onnx.proto; nothing here validates a model.

import numpy as np

# TensorProto.DataType values for the numpy dtypes the goldens use.
_ONNX_DTYPE = {
    np.dtype(np.float32): 1,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float64): 11,
}
_NUMPY_DTYPE = {v: k for k, v in _ONNX_DTYPE.items()}


def _varint(n):
    # int64 fields carry negative values as their 64-bit two's complement.
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire_type):
    return _varint((field << 3) | wire_type)


def _len_delimited(field, payload):
    return _key(field, 2) + _varint(len(payload)) + payload


def tensor_proto_bytes(array, name):
    """Serialises a numpy array as an ONNX TensorProto with raw little-endian data."""
    # np.ascontiguousarray promotes 0-d arrays to shape (1,); reshape keeps scalars rank 0.
    shape = np.shape(array)
    array = np.ascontiguousarray(array).reshape(shape)
    if array.dtype not in _ONNX_DTYPE:
        raise ValueError(f"unsupported dtype {array.dtype} for tensor '{name}'")
    out = bytearray()
    for d in array.shape:  # field 1: dims (proto2, unpacked)
        out += _key(1, 0) + _varint(int(d))
    out += _key(2, 0) + _varint(_ONNX_DTYPE[array.dtype])  # field 2: data_type
    out += _len_delimited(8, name.encode())  # field 8: name
    out += _len_delimited(9, array.astype(array.dtype.newbyteorder("<")).tobytes())  # raw_data
    return bytes(out)


def save_tensor(array, name, path):
    with open(path, "wb") as f:
        f.write(tensor_proto_bytes(array, name))


def _fields(buf):
    """Splits one message into (field number, wire type, value) triples."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(buf, pos)
        elif wire_type == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire_type == 2:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire_type == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield field, wire_type, value


def _read_varint(buf, pos):
    result, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


def load_tensor(path):
    """Reads a TensorProto written with raw_data (as save_tensor and onnx do for goldens)."""
    with open(path, "rb") as f:
        return parse_tensor(f.read(), path)


def load_initializers(path):
    """Returns {name: numpy array} for every initializer of a ModelProto (raw_data only)."""
    with open(path, "rb") as f:
        buf = f.read()
    graph = b"".join(value for field, _, value in _fields(buf) if field == 7)
    tensors = {}
    for field, _, value in _fields(graph):
        if field == 5:  # GraphProto.initializer
            name, array = parse_tensor(value, path)
            tensors[name] = array
    return tensors


def parse_tensor(buf, where="<bytes>"):
    """Decodes one serialized TensorProto into (name, numpy array); needs raw_data."""
    dims, dtype, name, raw = [], None, "", None
    for field, wire_type, value in _fields(buf):
        if field == 1 and wire_type == 0:
            dims.append(value)
        elif field == 1:  # packed dims
            pos = 0
            while pos < len(value):
                d, pos = _read_varint(value, pos)
                dims.append(d)
        elif field == 2:
            dtype = _NUMPY_DTYPE[value]
        elif field == 8:
            name = value.decode()
        elif field == 9:
            raw = value
    if raw is None:
        raise ValueError(f"{where}: tensor '{name}' has no raw_data")
    return name, np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(dims).astype(dtype)


class ModelSummary:
    """What the scripts need from a ModelProto: opsets, ops, initializers, graph I/O names."""

    def __init__(self, path):
        with open(path, "rb") as f:
            buf = f.read()
        self.opsets = {}
        graph = b""
        for field, _, value in _fields(buf):
            if field == 8:  # opset_import
                entry = dict((f, v) for f, _, v in _fields(value))
                self.opsets[entry.get(1, b"").decode()] = entry.get(2, 0)
            elif field == 7:
                graph = value
        self.op_types, self.initializers, self.inputs, self.outputs = [], {}, [], []
        for field, _, value in _fields(graph):
            if field == 1:
                self.op_types.append(_node_op_type(value))
            elif field == 5:
                name, dims = _initializer_name_dims(value)
                self.initializers[name] = dims
            elif field == 11:
                self.inputs.append(_value_info_name(value))
            elif field == 12:
                self.outputs.append(_value_info_name(value))

    def op_histogram(self):
        hist = {}
        for op in self.op_types:
            hist[op] = hist.get(op, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def parameter_count(self):
        count = 0
        for dims in self.initializers.values():
            n = 1
            for d in dims:
                n *= d
            count += n
        return count


def _node_op_type(node):
    op_type, domain = "", ""
    for field, _, value in _fields(node):
        if field == 4:
            op_type = value.decode()
        elif field == 7:
            domain = value.decode()
    return f"{domain}::{op_type}" if domain else op_type


def _initializer_name_dims(tensor):
    name, dims = "", []
    for field, wire_type, value in _fields(tensor):
        if field == 8:
            name = value.decode()
        elif field == 1 and wire_type == 0:
            dims.append(value)
        elif field == 1:
            pos = 0
            while pos < len(value):
                d, pos = _read_varint(value, pos)
                dims.append(d)
    return name, dims


def _value_info_name(value_info):
    for field, _, value in _fields(value_info):
        if field == 1:
            return value.decode()
    return ""


def format_histogram(hist):
    return ", ".join(f"{op} {n}" for op, n in hist.items())
