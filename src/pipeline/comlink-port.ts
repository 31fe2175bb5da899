/**
 * comlink over node:worker_threads MessagePorts: the adapter comlink ships for Node, typed for
 * ESM. (comlink's UMD build sets `module.exports` to the adapter function itself, which an ESM
 * default import yields at run time; its .d.ts describes an ES module with a default export.)
 */
import type { MessagePort } from 'node:worker_threads';
import type { Endpoint } from 'comlink';
import nodeAdapter from 'comlink/dist/umd/node-adapter.js';

const adapter = nodeAdapter as unknown as (port: MessagePort) => Endpoint;

/** A comlink Endpoint for one end of a MessageChannel (expose or wrap it; close the port when done). */
export function portEndpoint(port: MessagePort): Endpoint {
  return adapter(port);
}
