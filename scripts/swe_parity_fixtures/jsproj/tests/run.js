const assert = require('assert');
const { add, sub } = require('../calc');

describe('calc', function () {
  it('adds', function () { assert.strictEqual(add(1, 2), 3); });
  it('subtracts', function () { assert.strictEqual(sub(3, 1), 2); });
  it.skip('skipped one', function () {});
  describe('nested', function () {
    it('adds again', function () { assert.strictEqual(add(2, 2), 4); });
    it('is slow', function (done) { setTimeout(done, 120); });
  });
});
describe('other', function () {
  it('throws', function () { throw new Error('boom'); });
});
