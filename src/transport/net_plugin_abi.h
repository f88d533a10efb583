/*
 * The binary interface of NCCL's net plugins, as NCCL 2.28 loads them: the
 * tables a plugin exports under the names ncclNetPlugin_v11 ... ncclNetPlugin_v6,
 * the device-property structs each version fills, and the types of the logger
 * and profiler callbacks handed to its init. Written from NCCL's public plugin
 * headers (src/include/plugin/nccl_net.h and net/net_v6.h ... net_v11.h); every
 * struct here has the same members, in the same order, with the same C types,
 * as its NCCL counterpart, so that a plugin built against NCCL's headers reads
 * and writes them as its own. Only src/transport/net_plugin.c includes this.
 *
 * What changed between versions (what the adapter has to bridge):
 *   v6   the base: int sizes for regMr/isend/irecv, 8 requests per comm.
 *   v7   connect/accept take a device-offload handle; props gain netDeviceType
 *        and netDeviceVersion; getDeviceMr, irecvConsumed appended; 32 requests.
 *   v8   regMr takes a size_t; props gain regIsGlobal.
 *   v9   isend/irecv take size_t sizes; props gain forceFlush, virtual-NIC
 *        members and the largest p2p/collective transfer; makeVDevice appended.
 *   v10  init takes a profiler callback; connect takes a comm config (traffic
 *        class); isend/irecv take profiler handles.
 *   v11  init makes a context (and takes the comm id and config) that
 *        listen/connect receive; props gain maxMultiRequestSize; finalize and
 *        setNetAttr appended.
 * Tables only grow at the end: the first 17 members (name ... closeListen) sit
 * at the same places in every version.
 */
#ifndef BRAID_TRANSPORT_NET_PLUGIN_ABI_H
#define BRAID_TRANSPORT_NET_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define NET_PLUGIN_HANDLE_BYTES 128         /* NCCL_NET_HANDLE_MAXSIZE */
#define NET_PLUGIN_PTR_HOST 0x1             /* NCCL_PTR_HOST */
#define NET_PLUGIN_PTR_CUDA 0x2             /* NCCL_PTR_CUDA */
#define NET_PLUGIN_PTR_DMABUF 0x4           /* NCCL_PTR_DMABUF */
#define NET_PLUGIN_MAX_REQUESTS_V6 8        /* outstanding requests per comm, v6 */
#define NET_PLUGIN_MAX_REQUESTS 32          /* v7 and later */
#define NET_PLUGIN_MAX_SIZE (1ll << 30)     /* MAX_NET_SIZE: largest transfer before v9 */
#define NET_PLUGIN_MAX_DEVS_PER_NIC 4       /* NCCL_NET_MAX_DEVS_PER_NIC */
#define NET_PLUGIN_DEVICE_HOST 0            /* NCCL_NET_DEVICE_HOST: no device offload */
#define NET_PLUGIN_TRAFFIC_CLASS_UNDEF (-1) /* NCCL_NET_TRAFFIC_CLASS_UNDEF */

/* NCCL's log levels (ncclDebugLogLevel) and the subsystem bits Braid shares with it. */
enum {
  NET_PLUGIN_LOG_NONE = 0,
  NET_PLUGIN_LOG_VERSION = 1,
  NET_PLUGIN_LOG_WARN = 2,
  NET_PLUGIN_LOG_INFO = 3,
  NET_PLUGIN_LOG_ABORT = 4,
  NET_PLUGIN_LOG_TRACE = 5
};

/* ncclDebugLogger_t: the level is an enum, passed as an int. */
typedef void (*nccl_net_logger_t)(int level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);
/* ncclProfilerCallback_t (v10 and later). */
typedef ncclResult_t (*nccl_net_profiler_cb_t)(void** event, int type, void* parent,
                                               int64_t plugin_id, void* ext_data);

/* ---------------------------------------------------------------- properties */

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed; /* Mb/s */
  int port;
  float latency; /* µs */
  int maxComms;
  int maxRecvs;
} nccl_net_props_v6_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType; /* an enum in NCCL's header */
  int netDeviceVersion;
} nccl_net_props_v7_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
} nccl_net_props_v8_t;

typedef struct {
  int ndevs;
  int devs[NET_PLUGIN_MAX_DEVS_PER_NIC];
} nccl_net_vprops_t;

/* v9 and v10 share this layout. */
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  nccl_net_vprops_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} nccl_net_props_v9_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  nccl_net_vprops_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} nccl_net_props_v11_t;

/* ncclNetCommConfig_v10_t / _v11_t. */
typedef struct {
  int trafficClass;
} nccl_net_comm_config_t;

/* ------------------------------------------------------------------ tables */

/* The types of the slots that no version changed (each table still lists them in its order). */
typedef ncclResult_t (*nccl_net_devices_fn)(int* ndev);
typedef ncclResult_t (*nccl_net_reg_dmabuf_fn)(void* comm, void* data, size_t size, int type,
                                               uint64_t offset, int fd, void** mhandle);
typedef ncclResult_t (*nccl_net_dereg_fn)(void* comm, void* mhandle);
typedef ncclResult_t (*nccl_net_iflush_fn)(void* recv_comm, int n, void** data, int* sizes,
                                           void** mhandles, void** request);
typedef ncclResult_t (*nccl_net_test_fn)(void* request, int* done, int* sizes);
typedef ncclResult_t (*nccl_net_close_fn)(void* comm);

typedef struct {
  const char* name;
  ncclResult_t (*init)(nccl_net_logger_t log);
  nccl_net_devices_fn devices;
  ncclResult_t (*getProperties)(int dev, nccl_net_props_v6_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  nccl_net_reg_dmabuf_fn regMrDmaBuf;
  nccl_net_dereg_fn deregMr;
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  nccl_net_iflush_fn iflush;
  nccl_net_test_fn test;
  nccl_net_close_fn closeSend;
  nccl_net_close_fn closeRecv;
  nccl_net_close_fn closeListen;
} nccl_net_v6_t;

/* v7: device-offload handles (ncclNetDeviceHandle_v7_t**, passed as void**) at connect/accept. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(nccl_net_logger_t log);
  nccl_net_devices_fn devices;
  ncclResult_t (*getProperties)(int dev, nccl_net_props_v7_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm, void** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, void** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  nccl_net_reg_dmabuf_fn regMrDmaBuf;
  nccl_net_dereg_fn deregMr;
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  nccl_net_iflush_fn iflush;
  nccl_net_test_fn test;
  nccl_net_close_fn closeSend;
  nccl_net_close_fn closeRecv;
  nccl_net_close_fn closeListen;
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
} nccl_net_v7_t;

/* v8: regMr takes a size_t. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(nccl_net_logger_t log);
  nccl_net_devices_fn devices;
  ncclResult_t (*getProperties)(int dev, nccl_net_props_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm, void** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, void** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  nccl_net_reg_dmabuf_fn regMrDmaBuf;
  nccl_net_dereg_fn deregMr;
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  nccl_net_iflush_fn iflush;
  nccl_net_test_fn test;
  nccl_net_close_fn closeSend;
  nccl_net_close_fn closeRecv;
  nccl_net_close_fn closeListen;
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
} nccl_net_v8_t;

/* v9: size_t message sizes; makeVDevice. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(nccl_net_logger_t log);
  nccl_net_devices_fn devices;
  ncclResult_t (*getProperties)(int dev, nccl_net_props_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm, void** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, void** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  nccl_net_reg_dmabuf_fn regMrDmaBuf;
  nccl_net_dereg_fn deregMr;
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  nccl_net_iflush_fn iflush;
  nccl_net_test_fn test;
  nccl_net_close_fn closeSend;
  nccl_net_close_fn closeRecv;
  nccl_net_close_fn closeListen;
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* dev, nccl_net_vprops_t* props);
} nccl_net_v9_t;

/* v10: a profiler callback at init, a comm config at connect, profiler handles on requests. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(nccl_net_logger_t log, nccl_net_profiler_cb_t prof);
  nccl_net_devices_fn devices;
  ncclResult_t (*getProperties)(int dev, nccl_net_props_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, nccl_net_comm_config_t* config, void* handle, void** send_comm,
                          void** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, void** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  nccl_net_reg_dmabuf_fn regMrDmaBuf;
  nccl_net_dereg_fn deregMr;
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  nccl_net_iflush_fn iflush;
  nccl_net_test_fn test;
  nccl_net_close_fn closeSend;
  nccl_net_close_fn closeRecv;
  nccl_net_close_fn closeListen;
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* dev, nccl_net_vprops_t* props);
} nccl_net_v10_t;

/* v11: a context from init, passed to listen/connect and finalize. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t comm_id, nccl_net_comm_config_t* config,
                       nccl_net_logger_t log, nccl_net_profiler_cb_t prof);
  nccl_net_devices_fn devices;
  ncclResult_t (*getProperties)(int dev, nccl_net_props_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** send_comm, void** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, void** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  nccl_net_reg_dmabuf_fn regMrDmaBuf;
  nccl_net_dereg_fn deregMr;
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  nccl_net_iflush_fn iflush;
  nccl_net_test_fn test;
  nccl_net_close_fn closeSend;
  nccl_net_close_fn closeRecv;
  nccl_net_close_fn closeListen;
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* dev, nccl_net_vprops_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, void* net_attr); /* ncclNetAttr_v11_t* */
} nccl_net_v11_t;

/*
 * A CollNet table (ncclCollNetPlugin_v6 ... _v11): Braid has no CollNet, so it
 * reads only the name, the first member in every version.
 */
typedef struct {
  const char* name;
} nccl_collnet_head_t;

#endif
