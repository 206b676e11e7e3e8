// Runs Graphile Worker for stint-bench, speaking its child line protocol on
// stdin and stdout:
//
//   node graphile_runner.cjs worker DSN   a worker process: on "go" it runs
//                                         the no-op task, tuned as Graphile
//                                         Worker's performance documentation
//                                         says, and reports "ran N"
//   node graphile_runner.cjs client DSN   a client process: migrates the
//                                         schema, then only adds jobs
//
// Both answer "add N CHUNK" by adding N no-op jobs with batched addJobs
// calls of CHUNK jobs each (the worker through its own pool), then "ok" or
// "error MESSAGE". Closing stdin stops the process: a worker lets its jobs
// finish first.
"use strict";

const readline = require("node:readline");
const { Pool } = require("pg");
const { run, makeWorkerUtils, Logger } = require("graphile-worker");

const [mode, connectionString] = process.argv.slice(2);
const identifier = "bench_noop";

// Graphile Worker's documented tuning for throughput, per process.
const concurrentJobs = 24;
const maxPoolSize = 25;
const preset = {
  worker: {
    concurrentJobs,
    maxPoolSize,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};

// stdout carries the protocol: log warnings and errors to stderr only.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") {
    process.stderr.write(`graphile ${mode} ${level}: ${message}\n`);
  }
});

const say = (line) => process.stdout.write(line + "\n");

async function addChunks(utils, n, chunk) {
  for (let left = n; left > 0; ) {
    const k = Math.min(left, chunk);
    const specs = new Array(k);
    for (let i = 0; i < k; i++) specs[i] = { identifier, payload: {} };
    await utils.addJobs(specs);
    left -= k;
  }
}

async function main() {
  if (mode !== "worker" && mode !== "client") {
    throw new Error(`unknown mode ${mode}: want worker or client`);
  }
  // One pool per process, shared by the worker and its own adds.
  const pgPool = new Pool({ connectionString, max: maxPoolSize });
  const onError = (e) => process.stderr.write(`graphile ${mode}: pool: ${e.message}\n`);
  pgPool.on("error", onError);
  pgPool.on("connect", (client) => client.on("error", onError));
  const utils = await makeWorkerUtils({ pgPool, logger, preset });
  if (mode === "client") {
    await utils.migrate();
  }
  let runner = null;
  let ran = 0;
  let reported = 0;
  let ticker = null;
  const report = () => {
    if (ran !== reported) {
      reported = ran;
      say(`ran ${ran}`);
    }
  };
  // Adds run one after another, in the order they came.
  let queue = Promise.resolve();
  const lines = readline.createInterface({ input: process.stdin });
  lines.on("line", (line) => {
    const f = line.trim().split(/\s+/);
    if (f[0] === "go" && mode === "worker" && runner === null) {
      runner = run({
        pgPool,
        logger,
        preset,
        noHandleSignals: true,
        taskList: {
          [identifier]: async () => {
            ran++;
          },
        },
      });
      runner.catch((e) => {
        process.stderr.write(`graphile worker: ${e.stack || e}\n`);
        process.exit(1);
      });
      ticker = setInterval(report, 5);
    } else if (f[0] === "add" && f.length === 3) {
      const n = Number(f[1]);
      const chunk = Number(f[2]);
      queue = queue.then(async () => {
        if (!(n > 0 && chunk > 0)) {
          say(`error bad add command ${JSON.stringify(line)}`);
          return;
        }
        try {
          await addChunks(utils, n, chunk);
          say("ok");
        } catch (e) {
          say(`error ${String(e.message || e).replace(/\n/g, " ")}`);
        }
      });
    }
  });
  lines.on("close", async () => {
    try {
      await queue;
      if (runner !== null) {
        await (await runner).stop();
        clearInterval(ticker);
        report();
      }
      await utils.release();
      await pgPool.end();
      process.exit(0);
    } catch (e) {
      process.stderr.write(`graphile ${mode}: stop: ${e.stack || e}\n`);
      process.exit(1);
    }
  });
  say("ready");
}

main().catch((e) => {
  process.stderr.write(`graphile ${mode}: ${e.stack || e}\n`);
  process.exit(1);
});
