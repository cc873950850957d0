import test from 'node:test';
import assert from 'node:assert';
import calc from '../calc.js';

test('adds', () => assert.strictEqual(calc.add(1, 2), 3));
test('subtracts', () => assert.strictEqual(calc.sub(3, 1), 2));
test('skipped one', { skip: 'not today' }, () => {});
test('todo one', { todo: true }, () => {});
test('group', async (t) => {
  await t.test('inner passes', () => assert.ok(true));
  await t.test('inner fails', () => assert.ok(false));
});
