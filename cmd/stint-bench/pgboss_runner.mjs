// Runs pg-boss for stint-bench's workflow scenario, speaking a line
// protocol on stdin and stdout:
//
//   node pgboss_runner.mjs DSN   starts pg-boss (creating its schema), a
//                                queue and its no-op workers, then says
//                                "ready"
//
// "flow SHAPE A B" submits one flow of no-op jobs with pg-boss's flow()
// and answers "ok MS" (the milliseconds flow() took) or "error MESSAGE":
// fanout A (one job, then A jobs depending on it), fanin A (A jobs, then
// one depending on them all), layered A B (A layers of B jobs, each
// depending on two of the layer before), chain A (A jobs, each depending
// on the one before); diamonds A B submits A flows of 4 jobs each
// (a -> b, a -> c, {b, c} -> d) from B concurrent callers, each one flow
// at a time, and answers the milliseconds of all. Each job's data holds
// its index i in the flow (in all the diamonds).
// Closing stdin stops the process, letting its jobs finish.
//
// pg-boss is tuned as its documentation says for throughput and latency:
// LISTEN/NOTIFY on (useListenNotify, the queue's notify) so that workers
// wake when jobs are created, the flow resolver at its shortest interval
// (flowIntervalSeconds 1: pg-boss releases a completed job's dependents
// from that background loop, not in the completion), workers fetching
// batches and fetching again at once while batches come back full.
import readline from "node:readline";
import { PgBoss } from "pg-boss";

const [connectionString] = process.argv.slice(2);
const queue = "bench_noop";

const say = (line) => process.stdout.write(line + "\n");

function jobs(shape, a, b) {
  const out = [];
  const job = (i, dependsOn) => out.push({ ref: "j" + i, name: queue, data: { i }, dependsOn });
  switch (shape) {
    case "fanout":
      job(0);
      for (let i = 1; i <= a; i++) job(i, ["j0"]);
      break;
    case "fanin": {
      const deps = [];
      for (let i = 0; i < a; i++) { job(i); deps.push("j" + i); }
      job(a, deps);
      break;
    }
    case "layered":
      for (let l = 0; l < a; l++) {
        for (let k = 0; k < b; k++) {
          const i = l * b + k;
          job(i, l === 0 ? undefined : ["j" + ((l - 1) * b + k), "j" + ((l - 1) * b + ((k + 1) % b))]);
        }
      }
      break;
    case "chain":
      job(0);
      for (let i = 1; i < a; i++) job(i, ["j" + (i - 1)]);
      break;
    default:
      throw new Error(`unknown shape ${shape}`);
  }
  return out;
}

// diamonds submits n flows of a diamond of 4 jobs from callers concurrent
// callers, each taking the next flow once its last one was stored.
async function diamonds(boss, n, callers) {
  let next = 0;
  const caller = async () => {
    for (let k = next++; k < n; k = next++) {
      const job = (j, dependsOn) => ({ ref: "j" + j, name: queue, data: { i: 4 * k + j }, dependsOn });
      await boss.flow([job(0), job(1, ["j0"]), job(2, ["j0"]), job(3, ["j1", "j2"])]);
    }
  };
  await Promise.all(Array.from({ length: callers }, caller));
}

async function main() {
  const boss = new PgBoss({
    connectionString,
    max: 20,
    useListenNotify: true,
    flowIntervalSeconds: 1,
    schedule: false,
  });
  boss.on("error", (err) => process.stderr.write(`pg-boss error: ${err.stack || err}\n`));
  await boss.start();
  await boss.createQueue(queue, { notify: true });
  await boss.work(queue, {
    batchSize: 100,
    localConcurrency: 4,
    pollingIntervalSeconds: 0.5,
    notifyPollingIntervalSeconds: 0.5,
    burstWhenBatchFull: true,
  }, async () => {});
  say("ready");

  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [cmd, shape, a, b] = line.trim().split(/\s+/);
    if (cmd !== "flow") {
      say(`error unknown command ${cmd}`);
      continue;
    }
    try {
      if (shape === "diamonds") {
        const t0 = performance.now();
        await diamonds(boss, Number(a), Number(b));
        say(`ok ${(performance.now() - t0).toFixed(3)}`);
        continue;
      }
      const js = jobs(shape, Number(a), Number(b));
      const t0 = performance.now();
      await boss.flow(js);
      say(`ok ${(performance.now() - t0).toFixed(3)}`);
    } catch (err) {
      say(`error ${String(err.message || err).replace(/\s+/g, " ")}`);
    }
  }
  await boss.stop({ graceful: true, wait: true });
}

main().catch((err) => {
  process.stderr.write(`pg-boss runner: ${err.stack || err}\n`);
  process.exit(1);
});
