// A tiny library with one bug (sub is off by one), so every runner reports a failure.
exports.add = (a, b) => a + b;
exports.sub = (a, b) => a - b + 1;
