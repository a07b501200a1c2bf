#!/usr/bin/env node
// A Harness tenant client in Node.js: the template for calling Harness from a language other than Python.
//
// It talks to a running suite over plain gRPC, with nothing generated ahead of time: the .proto files are read
// at run time from the repository's protos/ directory (the API, package harness.v1) and from ./protos (two files
// of Google's googleapis, google/rpc/status.proto and error_details.proto, copied unchanged: they describe the
// error details Harness puts in its statuses). It:
//
//   (a) reserves a small VM at the cross-resource scheduler (CRS), ResourceManager/Reserve, with a request_id
//       (the idempotency key: a retry of the same request with the same id gets the same reservation);
//   (b) runs a command on that VM through the execution agent whose address the reservation gives,
//       ExecutionAgent/Execute, streaming its output and its exit code;
//   (c) asks for a VM no host can hold (one on a host with a trait no host has), and shows the refusal as a
//       client in any language sees it: the gRPC
//       status code, and the machine-readable reason, a google.rpc.ErrorInfo decoded from the
//       `grpc-status-details-bin` trailer (NEVER_FITS here). Branch on that reason, never on the message text;
//   (d) releases the reservation, ResourceManager/ReleaseReservation (also when a step before failed).
//
// Usage (from the repository's root, after scripts/node-client-deps):
//
//   node examples/clients/node/tenant.js --crs 127.0.0.1:50051 --tenant demo [-- COMMAND ARG...]
//
// A suite with a tenants file (README: "Tenants and their tokens") wants the tenant's token on every call, as
// gRPC metadata `authorization: Bearer <token>`: give it in HARNESS_TENANT_TOKEN, as the harness CLI takes it
// (or --token, which every user of the machine can read in the process list). A suite serving TLS: give its
// CA's certificate in HARNESS_TLS_CA_FILE.
//
// Output, one fact a line (stable, for scripts and tests to read):
//
//   reserved <reservation id> <state> <price per minute>
//   vm <vm id> host <physical host> agent <agent address>
//   note: <text>                        (the reservation's or the execution's notes, if any)
//   started <execution id>
//   stdout: <line>                      (and stderr: <line>)
//   exit <exit code> <reason or ->
//   impossible <the ResourceGroup asked for in (c), as JSON>
//   refused <CODE> <REASON or ->        then `retry-after <seconds>` (a RetryInfo), `violation <field>: <why>`
//                                       (a BadRequest), `message: <the status message, for people>`
//   released <reservation id> <state>
//
// Exit status 0 when all four steps went as expected (the command exited 0, the impossible request was refused,
// the release left the reservation released); otherwise 1, with a line on stderr saying what went wrong; 2 for a
// bad command line.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const USAGE = `usage: node tenant.js --crs HOST:PORT --tenant NAME [--token TOKEN] [--cores N] [--memory-gb GB]
                       [--request-id ID] [--timeout SECONDS] [--protos DIR] [-- COMMAND [ARG...]]
The command (default: echo hello from node) runs without a shell, as argv; HARNESS_TENANT_TOKEN is the token when
--token is not given, HARNESS_TLS_CA_FILE the CA to trust for a TLS suite.`;

// ---------------------------------------------------------------------------------------------------------------
// Loading the API. @grpc/proto-loader turns .proto files into service definitions for @grpc/grpc-js.
//   keepCase: field names as the .proto spells them (reservation_id, not reservationId);
//   enums: String: enum values by name ("STATE_ACTIVE"), as the .proto comments name them;
//   defaults: unset scalar fields read as their proto3 defaults (0, "", false) rather than undefined;
//   oneofs: a oneof's name holds which member is set (ExecuteEvent.event === "stdout").
// int64 fields come as strings (longs: String): JavaScript numbers cannot hold every int64.
const LOADER_OPTIONS = { keepCase: true, enums: String, longs: String, defaults: true, oneofs: true };

function loadApi(protosDir) {
  const files = ['harness/v1/irm.proto', 'harness/v1/agent.proto'];
  for (const f of files) {
    if (!fs.existsSync(path.join(protosDir, f))) {
      throw new Error(`no ${f} under ${protosDir}: give the repository's protos/ directory with --protos`);
    }
  }
  // irm.proto imports google/protobuf/any.proto: proto-loader has Google's well-known types built in.
  const definition = protoLoader.loadSync(files, { ...LOADER_OPTIONS, includeDirs: [protosDir] });
  return grpc.loadPackageDefinition(definition).harness.v1;
}

// The error details. A Harness error is a gRPC status whose trailers also carry `grpc-status-details-bin`: a
// serialized google.rpc.Status {code, message, details}, each detail a google.protobuf.Any (type_url + bytes) of
// google.rpc.ErrorInfo (reason, domain "harness.v1", metadata), RetryInfo (retry_delay) or BadRequest
// (field_violations). proto-loader makes no decoder for plain messages, so protobufjs (what proto-loader is built
// on) decodes them.
function loadErrorDetails() {
  const root = new protobuf.Root();
  const dir = path.join(__dirname, 'protos');
  root.resolvePath = (origin, target) => (target.startsWith('google/protobuf/') ? target : path.join(dir, target));
  root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
  return root;
}

// The google.rpc.Status of a failed call, its details decoded: {code, message, details: [{type, ...fields}]}; null
// when the server sent none (then handle the error by its code alone), or one that is not this call's (its code
// differs from the call's: a proxy in between may have answered).
function richStatus(err, detailsRoot) {
  const raw = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  if (!raw.length) return null;
  let status;
  try {
    // grpc-js has already base64-decoded the -bin trailer into a Buffer.
    status = detailsRoot.lookupType('google.rpc.Status').decode(raw[0]);
  } catch (e) {
    return null; // not a google.rpc.Status: handle the error by its code alone
  }
  if (status.code !== err.code) return null;
  const details = status.details.map((any) => {
    const type = any.type_url.slice(any.type_url.lastIndexOf('/') + 1); // "type.googleapis.com/google.rpc.ErrorInfo"
    let message;
    try {
      message = detailsRoot.lookupType(type);
    } catch (e) {
      return { type }; // a detail type this client does not know: skip it, as a newer server may send one
    }
    const fields = message.toObject(message.decode(any.value), { longs: Number, defaults: true });
    return { type, ...fields };
  });
  return { code: status.code, message: status.message, details };
}

function errorInfo(status) {
  const info = status && status.details.find((d) => d.type === 'google.rpc.ErrorInfo');
  return info && info.domain === 'harness.v1' ? info : null;
}

function retryAfterSeconds(status) {
  const retry = status && status.details.find((d) => d.type === 'google.rpc.RetryInfo');
  if (!retry || !retry.retry_delay) return null;
  return Number(retry.retry_delay.seconds || 0) + (retry.retry_delay.nanos || 0) / 1e9;
}

// ---------------------------------------------------------------------------------------------------------------
// Calling. The token travels as call metadata; grpc-js cannot attach call credentials to a plaintext channel, so
// each call is given the metadata itself.
function callMetadata(token) {
  const md = new grpc.Metadata();
  if (token) md.set('authorization', `Bearer ${token}`);
  return md;
}

// With TLS, the CA's certificate; the services' certificates name their IP addresses too (`harness up --tls`, `harness
// tls generate`), so --crs 127.0.0.1:PORT verifies (Node warns DEP0123 about a TLS server name that is an IP
// address: harmless here).
function channelCredentials() {
  const ca = process.env.HARNESS_TLS_CA_FILE;
  return ca ? grpc.credentials.createSsl(fs.readFileSync(ca)) : grpc.credentials.createInsecure();
}

// A unary call as a promise, with a deadline (every call should have one: a call without waits forever for a
// server that never answers).
function unary(client, method, request, token, timeoutS) {
  return new Promise((resolve, reject) => {
    client[method](request, callMetadata(token), { deadline: Date.now() + timeoutS * 1000 }, (err, reply) =>
      err ? reject(err) : resolve(reply));
  });
}

class Failure extends Error {}

function describe(err, detailsRoot) {
  if (err.code === undefined) return err.message;
  const status = richStatus(err, detailsRoot);
  const info = errorInfo(status);
  const bad = status && status.details.find((d) => d.type === 'google.rpc.BadRequest');
  const fields = bad ? ` [${bad.field_violations.map((v) => `${v.field}: ${v.description}`).join('; ')}]` : '';
  return `${grpc.status[err.code]}${info ? ` (${info.reason})` : ''}: ${err.details}${fields}`;
}

// A trait no host has (hosts' traits are in DiscoverResources): a request for it can never be placed.
const IMPOSSIBLE_TRAIT = 'no-host-has-this-trait';

function vmGroup(name, cores, memoryGb) {
  // ResourceGroup: attributes map attribute names to an AttributeRequest, a oneof (number, range or text).
  return { name, resource_type: 'vm', count: 1, attributes: { cores: { number: cores }, memory_gb: { number: memoryGb } } };
}

// Execute streams events (a oneof `event`): started, stdout/stderr bytes, utilisation samples, and exited last.
// Cancelling the stream would leave the command running at the agent (StopExecution stops it): here the command
// is given a limit the agent enforces (timeout_s), and the stream a deadline a little later.
function execute(agent, request, token, timeoutS, onStarted) {
  return new Promise((resolve, reject) => {
    const call = agent.Execute(request, callMetadata(token), { deadline: Date.now() + (timeoutS + 30) * 1000 });
    const out = { stdout: new LineWriter('stdout'), stderr: new LineWriter('stderr') };
    let exited = null;
    call.on('data', (ev) => {
      switch (ev.event) {
        case 'started':
          console.log(`started ${ev.started.execution_id}`);
          for (const n of ev.started.notes) console.log(`note: ${n}`);
          onStarted(ev.started.execution_id);
          break;
        case 'stdout':
        case 'stderr':
          out[ev.event].write(ev[ev.event]); // bytes: a Buffer, cut anywhere (even inside a UTF-8 character)
          break;
        case 'exited':
          exited = ev.exited;
          break;
        default: // 'sample': utilisation every half second (cpu_percent, memory_mb), not shown here
      }
    });
    call.on('error', reject);
    call.on('end', () => {
      out.stdout.end();
      out.stderr.end();
      if (exited) resolve(exited);
      else reject(new Failure('the agent ended the Execute stream before the command exited'));
    });
  });
}

// Prints a byte stream as `<name>: <line>` lines, whatever the chunks it comes in.
class LineWriter {
  constructor(name) {
    this.name = name;
    this.pending = Buffer.alloc(0);
  }

  write(chunk) {
    this.pending = Buffer.concat([this.pending, chunk]);
    let nl;
    while ((nl = this.pending.indexOf(10)) >= 0) {
      console.log(`${this.name}: ${this.pending.subarray(0, nl).toString('utf8')}`);
      this.pending = this.pending.subarray(nl + 1);
    }
  }

  end() {
    if (this.pending.length) console.log(`${this.name}: ${this.pending.toString('utf8')}`);
    this.pending = Buffer.alloc(0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
async function main(argv) {
  let opts;
  try {
    opts = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        crs: { type: 'string' },
        tenant: { type: 'string' },
        token: { type: 'string' },
        cores: { type: 'string', default: '1' },
        'memory-gb': { type: 'string', default: '0.25' },
        'request-id': { type: 'string' },
        timeout: { type: 'string', default: '60' },
        protos: { type: 'string', default: path.resolve(__dirname, '..', '..', '..', 'protos') },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (e) {
    console.error(`tenant.js: ${e.message}\n${USAGE}`);
    return 2;
  }
  const o = opts.values;
  if (o.help) {
    console.log(USAGE);
    return 0;
  }
  const cores = Number(o.cores);
  const memoryGb = Number(o['memory-gb']);
  const timeoutS = Number(o.timeout);
  if (!o.crs || !o.tenant || !(cores > 0) || !(memoryGb > 0) || !(timeoutS > 0)) {
    console.error(`tenant.js: --crs and --tenant are required; --cores, --memory-gb and --timeout are numbers above 0\n${USAGE}`);
    return 2;
  }
  const command = opts.positionals.length ? opts.positionals : ['echo', 'hello from node'];
  const token = o.token !== undefined ? o.token : (process.env.HARNESS_TENANT_TOKEN || '').trim();
  const tenant = o.tenant;

  const api = loadApi(path.resolve(o.protos));
  const detailsRoot = loadErrorDetails();
  const credentials = channelCredentials();
  const crs = new api.ResourceManager(o.crs, credentials);

  let reservation = null;
  let agent = null;
  let execution = '';
  let failure = null;

  // Ctrl-C or SIGTERM while the command runs: stop it at the agent (ending this process would not) and release.
  let stopping = false;
  const stop = async (signal) => {
    if (stopping) return;
    stopping = true;
    console.error(`tenant.js: ${signal}: stopping`);
    if (agent && execution) {
      await unary(agent, 'StopExecution', { tenant, execution_id: execution }, token, 10).catch((e) =>
        console.error(`tenant.js: could not stop execution ${execution}: ${describe(e, detailsRoot)}`));
    }
    if (reservation) await release(reservation.id).catch(() => {});
    process.exit(130);
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));

  async function release(id) {
    const released = await unary(crs, 'ReleaseReservation', { tenant, reservation_id: id }, token, timeoutS);
    console.log(`released ${released.id} ${released.state}`);
    return released;
  }

  try {
    // (a) Reserve. A retry after a lost answer must reuse the request_id, or it may reserve twice.
    const requestId = o['request-id'] || `node-${crypto.randomUUID()}`;
    try {
      reservation = await unary(crs, 'Reserve', { tenant, request_id: requestId, groups: [vmGroup('node', cores, memoryGb)] },
        token, timeoutS);
    } catch (e) {
      throw new Failure(`Reserve failed: ${describe(e, detailsRoot)}`);
    }
    console.log(`reserved ${reservation.id} ${reservation.state} ${reservation.price_per_minute}`);
    for (const n of reservation.notes) console.log(`note: ${n}`);
    if (reservation.state !== 'STATE_ACTIVE') throw new Failure(`reservation ${reservation.id} is ${reservation.state}`);
    const vms = reservation.groups.filter((g) => g.resource_type === 'vm').flatMap((g) => g.resources);
    if (!vms.length) throw new Failure(`reservation ${reservation.id} holds no VM`);
    const vm = vms[0];
    // AllocatedResource.address: where to reach the VM, its execution agent's gRPC address.
    console.log(`vm ${vm.id} host ${vm.physical_id} agent ${vm.address}`);
    for (const n of vm.notes) console.log(`note: ${n}`);

    // (b) Execute through the VM's agent, with the same token: the agent checks the tenant too.
    agent = new api.ExecutionAgent(vm.address, credentials);
    let exited;
    try {
      exited = await execute(agent, { tenant, vm_id: vm.id, argv: command, timeout_s: timeoutS }, token, timeoutS,
        (id) => { execution = id; });
    } catch (e) {
      throw e instanceof Failure ? e : new Failure(`Execute failed: ${describe(e, detailsRoot)}`);
    }
    console.log(`exit ${exited.exit_code} ${exited.reason || '-'}`);
    if (exited.exit_code !== 0) failure = `the command exited ${exited.exit_code}${exited.reason ? ` (${exited.reason})` : ''}`;

    // (c) Something no host can hold: a VM on a host with a trait no host has. Refused, and the reason says it
    // would never fit (change the request, do not retry it), where CAPACITY_IN_USE would say "retry after the
    // RetryInfo delay". (A VM larger than the largest host is refused before placement: INVALID_ARGUMENT with a
    // BadRequest naming the attribute and its domain, which DescribeAllocationSpec tells in advance.)
    const impossible = { ...vmGroup('impossible', cores, memoryGb), required_traits: [IMPOSSIBLE_TRAIT] };
    console.log(`impossible ${JSON.stringify(impossible)}`);
    let oops = null;
    try {
      oops = await unary(crs, 'Reserve', {
        tenant, request_id: `${requestId}-impossible`, groups: [impossible],
      }, token, timeoutS);
    } catch (e) {
      if (e.code === undefined) throw e;
      const status = richStatus(e, detailsRoot);
      const info = errorInfo(status);
      console.log(`refused ${grpc.status[e.code]} ${info ? info.reason : '-'}`);
      const retry = retryAfterSeconds(status);
      if (retry !== null) console.log(`retry-after ${retry}`);
      const bad = status && status.details.find((d) => d.type === 'google.rpc.BadRequest');
      for (const v of bad ? bad.field_violations : []) console.log(`violation ${v.field}: ${v.description}`);
      console.log(`message: ${e.details}`);
    }
    if (oops) {
      await unary(crs, 'ReleaseReservation', { tenant, reservation_id: oops.id }, token, timeoutS).catch(() => {});
      throw new Failure(`the impossible request was reserved (${oops.id}, released again): expected a refusal`);
    }
  } catch (e) {
    failure = e instanceof Failure ? e.message : (e.stack || String(e));
  } finally {
    // (d) Release, whatever happened before (releasing twice is no error).
    if (reservation) {
      try {
        const released = await release(reservation.id);
        if (released.state !== 'STATE_RELEASED') failure = failure || `release left ${released.id} ${released.state}`;
      } catch (e) {
        failure = failure || `ReleaseReservation failed: ${describe(e, detailsRoot)}`;
      }
    }
    crs.close();
    if (agent) agent.close();
  }
  if (failure) {
    console.error(`tenant.js: ${failure}`);
    return 1;
  }
  return 0;
}

// The helpers, for a script of your own: require('./tenant.js') runs nothing.
module.exports = { loadApi, loadErrorDetails, richStatus, errorInfo, retryAfterSeconds, callMetadata, unary };

if (require.main === module) {
  main(process.argv.slice(2)).then((status) => { process.exitCode = status; }, (e) => {
    console.error(`tenant.js: ${e.stack || e}`);
    process.exitCode = 1;
  });
}
